from bot.server import main

main()
